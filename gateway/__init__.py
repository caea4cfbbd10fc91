"""gateway: the public HTTP API of voicering (see README.md). Never imports torch or vLLM.

The package root imports nothing: pick the module you need (`gateway.tenants`, `gateway.quotas`,
`gateway.usage`, `gateway.settings`), so importing one part never drags in another.
"""

__all__: list[str] = []
