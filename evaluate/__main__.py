"""python -m keelrl.evaluate RUN_DIR_OR_MODEL ...: see keelrl.evaluate."""

from keelrl.evaluate import main

raise SystemExit(main())
