"""The tests' Mosquitto: the one copy in :mod:`hil.loopback`, named as the tests import it."""

from hil.loopback import Broker, free_port, mosquitto_binary, start_broker

__all__ = ["Broker", "free_port", "mosquitto_binary", "start_broker"]
