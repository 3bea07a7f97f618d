"""The Ray fleet: samplers and inference workers as Ray actors on any node (the ``ray`` extra).

Ray is imported only under this folder."""
