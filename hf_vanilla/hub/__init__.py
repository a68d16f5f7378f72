"""The model folder, its card, and pushing it to the Hugging Face Hub."""
