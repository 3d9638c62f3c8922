"""Routing of messages between connections, subscribers and agents."""

from talkbridge.router.outbound import OutboundQueue
from talkbridge.router.talk_router import RoutedTalk, TalkRouter

__all__ = ["OutboundQueue", "RoutedTalk", "TalkRouter"]
