"""The kernels below the model code: the CPU path's C sources and their loader (native.py), the 4-bit weight
formats (q4.py: PyTorch's int4 kernel; w4a8.py: 4-bit weights times int8 activations in C), and the decode
step's other backend (cuda_graphs.py: CUDA graphs on a GPU)."""
