"""A four-layer 1-D CNN (~100k parameters) with global average pooling: the fastest model on CPU."""
from torch import nn

from models.blocks import conv_block


class CNN1D(nn.Module):
    def __init__(self, in_channels, num_classes, dropout=0.1, norm="batch"):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(in_channels, 32, 7, norm),
            conv_block(32, 64, 5, norm),
            nn.MaxPool1d(2),
            conv_block(64, 128, 5, norm),
            nn.MaxPool1d(2),
            conv_block(128, 128, 3, norm),
            nn.AdaptiveAvgPool1d(1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.head(self.features(x))
