"""Telegram Bot API connector (aiogram 3).

`config` is importable without aiogram; `codec` is pure (payload <-> message, Markdown -> HTML);
`transport` holds the aiogram `Bot` and is imported only when a Telegram connection exists.
"""
