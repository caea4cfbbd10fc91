"""lora_training."""
