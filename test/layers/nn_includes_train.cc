// Not compiled: the "layers_catch_violation" test checks this file as if it were in worker/nn,
// and expects cmake/check_layers.cmake to refuse it (nn does not link train).
#include "worker/train/trainer.h"
