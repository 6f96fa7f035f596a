"""torch kernels written over their own input, as attnlab calls them: each must equal its out-of-place form
bit for bit. Beam search writes the CPU step's log-probs over its logits (`aten::_log_softmax.out`,
`attnlab.decoding.search`); `output_layer_loss` writes each chunk's softmax over its logits
(`aten::_softmax.out`, `attnlab.training.loss`). A torch whose last-dimension kernel stops reading a row
before writing it fails here."""

from __future__ import annotations

import itertools

import pytest
import torch

KERNELS = {
    "log_softmax": (torch.ops.aten._log_softmax.out, torch.log_softmax),
    "softmax": (torch.ops.aten._softmax.out, torch.softmax),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_written_over_its_input_is_bitwise_its_out_of_place_form(kernel: str, threads: int) -> None:
    inplace, reference = KERNELS[kernel]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        for rows, vocab in itertools.product((1, 5, 64, 320, 512), (7, 16, 50, 5000, 8001)):
            x = torch.randn(rows, vocab) * 5
            y = x.clone()
            assert torch.equal(inplace(y, -1, False, out=y), reference(x, -1))
            assert torch.equal(y, reference(x, -1))
    finally:
        torch.set_num_threads(before)
