"""The paper's training recipe: arguments, the learning-rate schedule, the Trainer, resuming,
checkpoint averaging, launch checks, the run itself."""
