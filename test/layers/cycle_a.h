// Not compiled: the "layers_catch_cycle" test checks this file as if it were
// launcher/plan/cycle_a.h, with cycle_b.cc as launcher/plan/cycle_b.cc, and expects
// cmake/check_layers.cmake to name the cycle.
#pragma once

#include "launcher/plan/cycle_b.h"
