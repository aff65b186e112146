"""A sandbox host: drivers, warm pools, declared environments' layers and the
gateway for its own sandboxes, behind the :class:`podbay.control.nodes.Node`
interface (in process for ``podbay serve``, over HTTP for ``podbay node``)."""
