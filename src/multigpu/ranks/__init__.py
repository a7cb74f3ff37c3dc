"""The functions ranks run: every function a notebook hands to ``spawn`` or
``torchrun``, one module per lesson, each named ``*_rank`` (07 on)."""
