"""What cameras this device can see: V4L2 device nodes (from :mod:`agent.setup.cameras`) and
ONVIF cameras on the local link, found by WS-Discovery and asked for their RTSP profiles.

Modules: :mod:`.xmlsafe` (the one entry point for untrusted XML), :mod:`.wsdiscovery` (the
Probe/ProbeMatch exchange over UDP multicast, TTL 1, bounded in time), :mod:`.onvif`
(GetCapabilities, GetProfiles and GetStreamUri over HTTP with WS-UsernameToken),
:mod:`.report` (all of it together, as JSON or a table), :mod:`.safetext` (what a camera
said, made one printable line before it is shown or written). Nothing runs at import time.
"""
