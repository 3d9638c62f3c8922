"""Import discord.py once, quietly.

discord.py imports the stdlib `audioop` (for voice, which talkbridge never uses), and Python 3.11+
warns that it is deprecated; under `-W error` that warning would make the import fail. Every
module of this connector imports discord.py through here.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*audioop.*", category=DeprecationWarning)
    import discord
    import discord.gateway
    import discord.http

__all__ = ["discord"]
