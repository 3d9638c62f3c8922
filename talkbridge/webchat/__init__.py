"""The bundled webchat: a page, its wire protocol and the connector that serves both."""

from talkbridge.webchat.connector import CONNECTION_ID, WebchatConnector

__all__ = ["CONNECTION_ID", "WebchatConnector"]
