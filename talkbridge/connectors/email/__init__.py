"""Email connector: IMAP (aioimaplib, IDLE or polling) in, SMTP (aiosmtplib) out.

`config` is importable without the SDKs; `codec` is pure (RFC 5322 bytes <-> messages, HTML ->
text, quote trimming, loop-safety rules); `backlog` (pure) picks the unread mail a first start
answers; `transport` holds the IMAP and SMTP clients.
"""
