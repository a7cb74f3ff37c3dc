"""The memory ledger: what one recorded DataParallel step creates per device, by
category (03). Every category is measured on the tensors themselves:

- "parameters": each replica's copy of the weights and buffers (on
  ``device_ids[0]`` the replica shares the model's own memory);
- "inputs": each device's chunk of the batch (and, from ``record_step``, the
  targets on ``output_device``);
- "activations": the tensors forward saves for backward, caught with
  ``torch.autograd.graph.saved_tensors_hooks`` in each replica's thread, counted
  once per storage and leaving out what is counted elsewhere (the replica's
  weights, inputs and outputs); on ``output_device`` also what the loss saves
  (cross-entropy keeps its log-softmax, as large as the gathered outputs);
- "outputs": each replica's output; "gathered": the outputs concatenated on
  ``output_device``; "loss": the loss value;
- "replica gradients": the gradients of each replica's weights, caught by hooks
  during backward. Every replica materialises a full set on its own device
  before they are summed (PyTorch's ``Broadcast.backward`` runs
  ``ReduceAddCoalesced`` once all of them exist);
- "gradients": the summed ``.grad`` of the model's parameters on
  ``device_ids[0]``.

The ledger adds up what a step creates and keeps for a while, as if nothing were
freed: a breakdown by category, neither the peak nor a bound on it. It leaves out
the tensors that live only briefly (a convolution's output that its ReLU replaces,
the gradients of the activations during backward), which the peak includes.
"""

__all__ = ["MEMORY_CATEGORIES"]

MEMORY_CATEGORIES = (
    "parameters",  # each replica's weights and buffers
    "inputs",  # each device's chunk of the batch (+ the targets on output_device)
    "activations",  # tensors forward (and the loss) saved for backward
    "outputs",  # each replica's output
    "gathered",  # the outputs concatenated on output_device
    "loss",  # the loss value
    "replica gradients",  # each replica's weight gradients, before they are summed
    "gradients",  # the summed .grad of the model's parameters, on device_ids[0]
)
