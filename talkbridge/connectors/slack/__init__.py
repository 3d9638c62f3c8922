"""Slack: Socket Mode (default) or the Events API over HTTP, and the Web API, via slack-sdk."""
