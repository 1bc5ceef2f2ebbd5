// The harness's CPU kernels as one translation unit, the one modules/kernels/build.py compiles: torch's headers, most
// of a build's time, are compiled once (five kernels in ~17 s of one core on the Xeon, where each alone took ~13-15
// s).
// Each kernel is its own .cpp beside this file, with its own TORCH_LIBRARY namespace and its loader's .py.
#include "rms_norm.cpp"
#include "gelu_tanh.cpp"
#include "glu.cpp"
#include "rotary.cpp"
#include "head_norm.cpp"
#include "dyt.cpp"
