"""One convolutional block (paper 3.2): dropout, a 1-D convolution to 2d channels, a GLU, a scaled residual."""

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from convs2s_runtime.step import add_residual, glu_conv_step

from .dropout import Dropout
from .weight_norm import WeightNormConvTBC, WeightNormLinear, glu_input_std, linear_std


class ConvBlock(nn.Module):
    """``h^l = (glu(W^l [h^{l-1}_{i-k/2} .. h^{l-1}_{i+k/2}] + b^l) + h^{l-res}) * sqrt(0.5)``.

    A ``causal`` block (the decoder's) pads ``k - 1`` steps on the left only, so output ``i`` sees inputs
    ``i - k + 1 .. i``; otherwise the padding is split so the output is as long as the input. The residual comes
    from ``residual`` blocks back (0: none) through a linear projection where the widths differ.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        residual: int,
        residual_channels: int,
        dropout: float,
        causal: bool,
    ):
        super().__init__()
        self.dropout_module = Dropout(dropout, module_name=type(self).__name__)
        # the conv feeds a GLU and sees dropped-out input: std sqrt(4p / (k * in)) (paper 3.5)
        self.conv = WeightNormConvTBC(
            in_channels, 2 * out_channels, kernel_size, std=glu_input_std(kernel_size * in_channels, dropout)
        )
        self.residual = residual
        self.residual_projection = (
            WeightNormLinear(residual_channels, out_channels, std=linear_std(residual_channels))
            if residual > 0 and residual_channels != out_channels
            else None
        )
        self.kernel_size = kernel_size
        self.causal = causal
        self.padding = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)
        self.attention: Optional[nn.Module] = None  # the decoder puts multi-step attention here (paper 3.3)

    def glu_conv(self, x: Tensor) -> Tensor:
        """x: B x T x in -> B x T x out: dropout, padded convolution, GLU (full sequence)."""
        x = self.dropout_module(x)
        x = self.conv(x.transpose(0, 1), padding=self.padding)  # B x T x C -> T x B x C, conv_tbc's layout
        return F.glu(x, dim=2).transpose(0, 1)  # T x B x 2*out -> T x B x out -> B x T x out

    def glu_conv_step(self, x: Tensor, window: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """One decoding step of a causal block: x: B x in, the new input; window: the previous k - 1 inputs,
        flattened time-major, B x (k-1)*in (None at the first step, which sees the left zero padding).
        Returns the GLU output (B x out) and the next window: dropout, then the convolution as one matrix
        product over the window and the new input (``convs2s_runtime.step.glu_conv_step``)."""
        return glu_conv_step(self.dropout_module(x), window, self.conv.forward_window, self.kernel_size)

    def add_residual(self, x: Tensor, outputs: Sequence[Tensor]) -> Tensor:
        """(x + residual) * sqrt(0.5), the residual taken ``self.residual`` outputs back in ``outputs``."""
        return add_residual(x, outputs, self.residual, self.residual_projection)


def run_block(block_fn: Callable[..., object], *args, checkpointed: bool):
    """``block_fn(*args)``: one block of a full pass. With ``checkpointed`` (``--checkpoint-activations``) and
    gradients on, through torch's activation checkpointing: the backward pass keeps the arguments alone and runs
    ``block_fn`` again for the rest, with the random state of the first run (so the same dropout masks).

    Porting note (fconv): fconv keeps every activation of every block for the backward pass; fairseq's transformer
    offers this flag, fconv does not."""
    if checkpointed and torch.is_grad_enabled():
        return checkpoint(block_fn, *args, use_reentrant=False)
    return block_fn(*args)


def build_blocks(layers: Sequence, dropout: float, causal: bool) -> List[ConvBlock]:
    """Build the blocks of one stack; block i takes the width of block i - 1 (the first, layers[0].width)."""
    widths = [layers[0].width]  # outputs so far: the input projection, then each block
    blocks = []
    for layer in layers:
        residual_channels = widths[-layer.residual] if layer.residual > 0 else layer.width
        blocks.append(
            ConvBlock(widths[-1], layer.width, layer.kernel, layer.residual, residual_channels, dropout, causal)
        )
        widths.append(layer.width)
    return blocks
