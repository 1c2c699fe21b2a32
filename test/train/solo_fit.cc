#include "test/train/solo_fit.h"

#include "worker/comm/ring_communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"

namespace dtrain::testing {

std::vector<float> solo_fit(const train::TrainConfig& c, const std::string& run_dir,
                            const SoloFitOptions& options) {
  auto backend = nn::make_dnnl_backend(c.math);
  comm::SoloCommunicator solo;
  auto [train_data, test_data] =
      data::load_data(c.data, {c.model.height, c.model.width, c.model.channels});
  int polls = 0;
  int stop_after = options.stop_after;
  train::TrainerOptions trainer_options{run_dir, true, "worker:0", 0,
                                        [&] { return stop_after > 0 && ++polls >= stop_after; }};
  train::ModelParts warm;
  if (options.warm) warm = train::warm_model_parts(c, *backend, train_data);
  train::Trainer trainer(c, *backend, solo, std::move(train_data), std::move(test_data),
                         trainer_options, options.control, std::move(warm));
  if (options.resumed_at) *options.resumed_at = trainer.resumed_from().global_step;
  train::EpochMetrics metrics = trainer.fit();
  if (options.last) *options.last = metrics;
  return trainer.model().parameters().to_host();
}

}  // namespace dtrain::testing
