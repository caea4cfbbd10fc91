"""The gateway's HTTP API: the OpenAI-style speech endpoint and the audio path behind it.

`encode` turns the workers' 24 kHz s16le PCM into the response format as it streams; `speed`
time-stretches that PCM for the request's `speed`. Both use PyAV (ffmpeg), never torch.
"""
