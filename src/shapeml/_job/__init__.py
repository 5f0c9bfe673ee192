"""What a job of several processes needs below every package: the watchdog that bounds every
wait on the job's devices (`_watchdog`), and one file written from a job (`_single_file`)."""
