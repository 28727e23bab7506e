"""sagemaker_training.content_types: the IANA media types the encoders know."""
JSON = "application/json"
CSV = "text/csv"
OCTET_STREAM = "application/octet-stream"
ANY = "*/*"
NPY = "application/x-npy"
# Types whose payloads are text (UTF-8); the others are bytes.
UTF8_TYPES = [JSON, CSV]
