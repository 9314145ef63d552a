
class MaskFirst(nn.Module):
    def forward(self, mask, x):
        return x * mask
