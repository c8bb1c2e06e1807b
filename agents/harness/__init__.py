"""keelrl.agents.harness: the run harness under every agent's training loop, one module per job.

    seeds.py          `SeedRuns`: the seeds of --num-seeds trained by one loop, one `Run` each in lockstep, the
                      agent stacked along a seed axis (keelrl.networks.seeds)
    loop.py           `Run`, the loop contract: an agent's loop shows the algorithm's steps (act, step the env,
                      store, update); `Run` counts them and does the rest between iterations (see its docstring)
    run_directory.py  the run directory, config.json, and what --resume and --extend-to make of an earlier run
    options.py        `RunOptions` (the options every run has), their checks, presets, threads and seeds, the
                      command line: `parse_command_line` (any config dataclass, the benchmark scripts' too), and
                      `run_cli`, which trains an agent and turns a user's mistake into one line and exit code 2
    logs.py           TensorBoard (CleanRL's scalar names), episodes.csv and eval.csv, videos (--capture-video),
                      W&B, the progress bar and lines, the speeds (`Speeds`) and what a finished run prints
    saved_agent.py    `SavedAgent`, what every agent's networks save and load (training state, model.pt), written once
    checkpoints.py    when a run checkpoints (`CheckpointPolicy`: steps, minutes, a stop signal), checkpoints
                      (stamped with their replay buffer), model files and random states
    stopping.py       SIGTERM and Ctrl-C: finish the step, checkpoint, exit 128 + the signal number

A module imports only modules listed below it, and none imports an agent. The registry of agents by name is
keelrl.agents.registry, above every agent.

The loop contract, in ten lines (agents/iql.py and agents/stream_q.py have it whole; agents/sac.py the same through
`SeedRuns`, which takes --num-seeds; loop.py says what happens between iterations):

    run = Run(config, "sac", validate, total="total_timesteps")   # the config (under --resume, the saved one)
    with run:                                                     # at its end: logs closed, lock and signals freed
        env, agent, buffer = ...                                  # built from run.config
        run.start(config.env_id, agent, lambda agent, seed: evaluate(agent, ..., seed), numpy_rng=rng, replay=buffer)
        obs, _ = env.reset()                                      # (start restored a resumed run, held the signals)
        for global_step in run.steps(config.num_envs):            # logs, evaluates, checkpoints between iterations
            next_obs, rewards, terminated, truncated, info = env.step(agent.act(obs))
            ...                                                   # store; run.log(agent.update(batch))
            run.record_episodes(info)                             # the episodes that ended at this step
    return run.result()                                           # final evaluation, speeds, where the run is
"""
