"""The plugin's logger: LiveKit plugins log under `livekit.plugins.<name>`, so an agent author's
logging config for livekit's plugins covers this one too."""

import logging

logger = logging.getLogger("livekit.plugins.voicering")
