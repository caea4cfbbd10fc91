"""The whole platform on one machine: `voicering up` (supervised Redis, workers, gateway, trainer,
LiveKit agent) and `voicering demo` (a creator's and an app's day through it). Children are
`voicering` commands in processes of their own; nothing here imports torch or vLLM."""
