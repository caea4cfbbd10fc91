"""Upload quality: what is wrong with a creator's recordings, said in words they understand.

Each check measures one property of the audio (speech amount, sample rate and real bandwidth,
clipping, loudness, SNR, long silences, a second speaker) and returns `Finding`s: `block` (the
clone is refused, all blocks listed in one answer), `warn` (kept with the voice as `checks`) or
`fixed` (something the pipeline corrected, such as trimmed silences). Thresholds live in one
versioned `CheckThresholds`. Pure numpy on the cheap path; the speaker model (torch) is imported
only inside the module that needs it.
"""
