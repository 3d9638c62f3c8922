"""Example channel-message hook: route by keyword.

Every inbound message passes through `on_message`; what it returns decides what happens:
  None / Continue()         let the next hook (and the default routing) decide
  Drop(reason)              nobody answers
  Modify(message)           continue with a changed message
  RouteToAgent(name)        this agent answers
  RouteToSentinel()         the screening agent answers
  Forward(connection_id)    pass the message on to another connection
"""

from talkbridge.hooks import Decision, Drop, HookDeps, Modify, RouteToSentinel
from talkbridge.message import NormalizedMessage

TOPICS = {"refund": "billing", "invoice": "billing", "password": "account"}


class KeywordRouter:
    def __init__(self, deps: HookDeps) -> None:
        self.log = deps.logger

    async def on_message(self, msg: NormalizedMessage) -> Decision | None:
        text = msg.text.lower()
        if "spam" in text:
            return Drop("looks like spam")
        if "ignore previous instructions" in text:
            return RouteToSentinel()
        for keyword, topic in TOPICS.items():
            if keyword in text:
                self.log.info("routing %s to the %s desk", msg.id, topic)
                return Modify(msg.model_copy(update={"text": f"[{topic}] {msg.text}"}))
        return None


def create_hook(deps: HookDeps) -> KeywordRouter:
    return KeywordRouter(deps)
