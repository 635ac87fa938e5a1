# Regenerates the real PyTorch exports used as test fixtures (Debian python3-torch 1.13):
#   /usr/bin/python3 tests/data/make_torch_fixtures.py tests/data
import sys
import torch
import torch.nn as nn

out = sys.argv[1] if len(sys.argv) > 1 else "."
torch.manual_seed(0)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(torch.flatten(x, 1)))


m = SmallCNN().eval()
torch.onnx.export(m, torch.randn(2, 1, 8, 8), f"{out}/torch_small_cnn.onnx",
                  input_names=["x"], output_names=["logits"], opset_version=13,
                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                  do_constant_folding=False)
# Training-mode export keeps BatchNormalization (training_mode=1) and Dropout unfused.
torch.onnx.export(m.train(), torch.randn(2, 1, 8, 8), f"{out}/torch_small_cnn_train.onnx",
                  input_names=["x"], output_names=["logits"], opset_version=15,
                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
