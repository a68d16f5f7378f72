"""Write the folder that would be pushed to the Hugging Face Hub, and push it when asked.

A thin wrapper of `hf_vanilla.cli.publish` (installed as a command by `pip install`; see pyproject.toml)."""

from hf_vanilla.cli.publish import main

if __name__ == "__main__":
    main()
