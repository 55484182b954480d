"""Actions on a decision: publish on the local broker (robot, PLC) or POST to a webhook.

Start here::

    dispatcher = ActionDispatcher(config.actions.actions, config.mqtt, queue_bound=1000)
    dispatcher.start()
    dispatcher.dispatch(ActionEvent(...))  # never blocks
    dispatcher.stop(timeout_s=2.0)
"""

from agent.actions.config import ActionConfig, ActionsConfig, MqttAction, WebhookAction
from agent.actions.dispatcher import ActionDispatcher
from agent.actions.errors import ActionError, ActionFailed, ActionTimeout
from agent.actions.event import ActionEvent

__all__ = [
    "ActionConfig",
    "ActionDispatcher",
    "ActionError",
    "ActionEvent",
    "ActionFailed",
    "ActionTimeout",
    "ActionsConfig",
    "MqttAction",
    "WebhookAction",
]
