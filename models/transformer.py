"""A small Transformer encoder over tokens made by a strided convolutional
stem (32 tokens for 128 steps)."""
import torch
import torch.nn.functional as F
from torch import nn

from models.blocks import conv_block
from models.contract import HARModel


class HARTransformer(HARModel):
    SIZES = ("width", "depth", "heads", "ffn")  # d_model, encoder blocks, attention heads, FFN hidden size

    @staticmethod
    def resolve_size(width=64, depth=2, heads=4, ffn=None):
        if width % heads:
            raise ValueError(f"--width {width} is not divisible by --heads {heads}: every head gets width / heads "
                             "features; change one of them")
        return {"width": width, "depth": depth, "heads": heads, "ffn": ffn or 2 * width}

    def __init__(self, in_channels, num_classes, dropout=HARModel.DROPOUT, norm="batch", *, max_tokens=64, **size):
        """`size`: width, depth, heads and ffn as SIZES names them, each left out taking resolve_size's default."""
        super().__init__()
        size = self.resolve_size(**size)
        width, depth, heads, ffn = size["width"], size["depth"], size["heads"], size["ffn"]
        # Two stride-2 convolutions: 128 steps become 32 tokens, each seeing ~0.2 s of signal.
        self.stem = nn.Sequential(conv_block(in_channels, width, 5, norm, stride=2),
                                  conv_block(width, width, 3, norm, stride=2))
        self.position = nn.Parameter(torch.zeros(1, max_tokens, width))
        nn.init.trunc_normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=ffn, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Dropout(dropout), nn.Linear(width, num_classes))

    def fsdp_blocks(self):
        """The parts FSDP shards as units of their own, each gathered just before it runs: the encoder
        blocks. The stem, the position table and the head stay in the root's unit."""
        return list(self.encoder.layers)

    def forward(self, x):
        tokens = self.stem(x).transpose(1, 2)  # [B, tokens, width]
        tokens = tokens + self.positions(tokens.shape[1])
        return self.head(self.encoder(tokens).mean(dim=1))

    def positions(self, num_tokens):
        """[1, num_tokens, width] position embeddings: the table's first rows when it is long
        enough (128 steps use 32 of 64), else the table stretched over the longer sequence, so
        windows of any length work with the same parameters."""
        max_tokens = self.position.shape[1]
        if num_tokens <= max_tokens:
            return self.position[:, :num_tokens]
        stretched = F.interpolate(self.position.transpose(1, 2), size=num_tokens, mode="linear",
                                  align_corners=True)
        return stretched.transpose(1, 2)
