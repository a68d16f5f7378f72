"""Reading and writing files safely: checked loading of checkpoints and folders, atomic writes."""
