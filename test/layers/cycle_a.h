// Not compiled: the "layers_catch_cycle" test checks this file as if it were launcher/cycle_a.h,
// with cycle_b.cc as launcher/cycle_b.cc, and expects cmake/check_layers.cmake to name the cycle.
#pragma once

#include "launcher/cycle_b.h"
