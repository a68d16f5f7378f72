"""Turning a model folder into translations: loading (and quantization), decoding, batching inputs,
the CTranslate2 runtime, streaming stdin."""
