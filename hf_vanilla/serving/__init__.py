"""Translation over HTTP: a FastAPI application whose one model worker batches concurrent requests
together (``hf-vanilla-serve``; ``pip install 'hf_vanilla[serve]'``)."""
