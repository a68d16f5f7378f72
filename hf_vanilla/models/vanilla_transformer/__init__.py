"""The original Transformer: the files that travel into every model folder this package writes
(``trust_remote_code=True``). They import only torch, transformers and each other (relative imports),
and keep their file names: a folder's ``auto_map`` names them."""
