"""Discord connector: discord.py 2 over the gateway (inbound) and REST (outbound)."""
