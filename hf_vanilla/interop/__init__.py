"""Other formats: converting Marian/FSMT models in, exporting to CTranslate2 and ONNX."""
