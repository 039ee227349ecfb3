"""A four-layer 1-D CNN (~100k parameters) with global average pooling: the fastest model on CPU."""
from torch import nn

from models.blocks import conv_block
from models.contract import HARModel


class CNN1D(HARModel):
    SIZES = ("width",)  # channels of the last two layers; the first two have a quarter and a half of it
    STEP_RECORDS = True

    @staticmethod
    def resolve_size(width=128):
        if width < 4:
            raise ValueError(f"--width {width} is too narrow for cnn1d (its first layer has width / 4 channels)")
        return {"width": width}

    def __init__(self, in_channels, num_classes, dropout=HARModel.DROPOUT, norm="batch", width=128):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(in_channels, width // 4, 7, norm),
            conv_block(width // 4, width // 2, 5, norm),
            nn.MaxPool1d(2),
            conv_block(width // 2, width, 5, norm),
            nn.MaxPool1d(2),
            conv_block(width, width, 3, norm),
            nn.AdaptiveAvgPool1d(1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(width, num_classes))

    def forward(self, x):
        return self.head(self.features(x))
