"""The shared core under both halves: each model's configuration beside its tensor schema, the
checked checkpoint and its safetensors reader, input checks and the one error type, the
tokenizer and image output. It imports nothing of the project above it (README: Layout)."""
