"""DeepConvLSTM-style model: convolutions along time extract local motion, an LSTM links them."""
from torch import nn

from models.blocks import conv_block
from models.contract import HARModel


class CNNLSTM(HARModel):
    SIZES = ("width",)  # convolution filters and LSTM hidden units

    @staticmethod
    def resolve_size(width=64):
        return {"filters": width, "hidden": width}

    def __init__(self, in_channels, num_classes, dropout=HARModel.DROPOUT, norm="batch", filters=64, hidden=64):
        super().__init__()
        self.features = nn.Sequential(*[
            conv_block(in_channels if i == 0 else filters, filters, 5, norm) for i in range(4)
        ])
        self.lstm = nn.LSTM(filters, hidden, num_layers=2, batch_first=True,
                            dropout=dropout)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, x):
        features = self.features(x).transpose(1, 2)  # [B, T, filters]
        sequence, _ = self.lstm(features)
        return self.head(sequence[:, -1])  # the last step has seen the whole window
