"""Every use of a private transformers API in fastlight, in one module.

Each name here is used because no public API does the job; :data:`CHECKED` is the release range they
were checked against, and tests/test_compat.py fails, naming this module, once the installed
transformers leaves it (then re-read this list and run tests/vla/test_vla_hf.py):

- ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY`` and a ``PreTrainedModel``'s
  ``_can_record_outputs`` / ``_output_capturing_hooks_installed``, with ``nn.Module``'s hook dicts:
  :func:`reset_output_capture`;
- ``PreTrainedModel._no_split_modules`` (what accelerate wraps as one unit): :func:`no_split_classes`.
"""

from __future__ import annotations

from torch import nn

#: The transformers releases, ``low <= version < high``, the touches below were checked against.
CHECKED = ("5.25.0", "5.26")

#: The transformers module whose forward hooks capture hidden states (see :func:`reset_output_capture`).
_CAPTURE = "transformers.utils.output_capturing"


def reset_output_capture(module: nn.Module) -> None:
    """Make the transformers models inside ``module`` (a copy or an unpickled one) capture hidden
    states again, and picklable: the capture hooks (closures pickle refuses) are dropped, re-installed
    on next use, and each model is re-registered in the process-wide registry (an unpickled model was
    never constructed in its process and would silently record nothing)."""
    try:
        from transformers.modeling_utils import PreTrainedModel
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without this machinery needs nothing
        return
    for m in module.modules():
        keys = [k for k, fn in m._forward_hooks.items() if getattr(fn, "__module__", "") == _CAPTURE]
        for hooks in (m._forward_hooks, m._forward_hooks_with_kwargs, m._forward_hooks_always_called):
            for key in keys:
                hooks.pop(key, None)
        if isinstance(m, PreTrainedModel):
            m._output_capturing_hooks_installed = False
            _CAN_RECORD_REGISTRY[m] = m._can_record_outputs


def no_split_classes(module: nn.Module) -> set[type[nn.Module]]:
    """The classes of ``module``'s submodules that its Hugging Face models list in ``_no_split_modules``
    (transformer blocks: the units accelerate, and FSDP2 here, keep whole)."""
    from transformers import PreTrainedModel

    names = {n for m in module.modules() if isinstance(m, PreTrainedModel) for n in m._no_split_modules or ()}
    return {type(m) for m in module.modules() if type(m).__name__ in names}
