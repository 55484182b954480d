"""GenICam cameras (GigE Vision, USB3 Vision) through Aravis, the ``genicam`` camera kind.

- :mod:`.aravis`: libaravis-0.8's C API by ctypes (the device list, a camera, its
  features, its stream and buffers); why ctypes: docs/adr/0025-genicam-through-aravis.md.
- :mod:`.config`: the ``[cameras.genicam]`` table (what ``check-config`` can check
  without the camera).
- :mod:`.source`: the capture source: features set and read back at open, software and
  hardware triggers, incomplete frames counted, reason words; and its counters.
- :mod:`.pixels`: Mono8, Bayer 8-bit, RGB8 and BGR8 converted to BGR into a ring of
  preallocated images.
- :mod:`.clock`: the camera's clock mapped to the host's (offset, drift, error).

Nothing here loads libaravis at import: a camera's first open does (reason word
``unavailable`` when it is not installed). docs/cameras.md says how to use one.
"""
