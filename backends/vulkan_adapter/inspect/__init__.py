"""Reading lowered Vulkan programs: payload decoding, the prepack check, the simulator.

Imported only when used (the adapter's ``__init__`` serves ``check``, ``simulate``
and ``decode_payload`` from here lazily), so lowering never pays for it.

* :mod:`.payload` — decode a VkGraph flatbuffer and its constant bytes;
* :mod:`.prepack_check` — :func:`~.prepack_check.check`: what the runtime would abort on;
* :mod:`.simulator` — run a lowered program on the CPU from its payloads;

"""
