// See model_tensors.h.
#include "worker/train/model_tensors.h"

namespace dtrain::train {

ModelTensors::ModelTensors(nn::Model& model,
                           std::vector<std::pair<std::string, nn::Buffer<float>*>> slots)
    : model_(model), slots_(std::move(slots)) {}

const std::vector<TensorView>& ModelTensors::download() {
  host_.clear();
  views_.clear();
  auto add = [&](const std::string& prefix, const std::vector<nn::ParamInfo>& infos) {
    for (const nn::ParamInfo& p : infos)
      views_.push_back({prefix + p.name, p.shape, host_.back().data() + p.offset, p.count});
  };
  host_.push_back(model_.parameters().to_host());
  add("", model_.parameter_infos());
  host_.push_back(model_.state().to_host());
  add("", model_.state_infos());
  for (auto& [slot, buffer] : slots_) {
    host_.push_back(buffer->to_host());
    add("optimizer." + slot + ".", model_.parameter_infos());
  }
  for (const HostTensor& t : extras_) {
    host_.push_back(*t.data);
    views_.push_back({t.name, t.shape, host_.back().data(), host_.back().size()});
  }
  return views_;
}

void ModelTensors::add_host_tensors(std::vector<HostTensor> tensors) {
  for (HostTensor& t : tensors) extras_.push_back(std::move(t));
}

void ModelTensors::upload() {
  model_.parameters().from_host(host_[0]);
  model_.state().from_host(host_[1]);
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].second->from_host(host_[2 + i]);
  for (size_t i = 0; i < extras_.size(); ++i) *extras_[i].data = host_[2 + slots_.size() + i];
}

size_t ModelTensors::weight_count() const {
  return model_.parameter_infos().size() + model_.state_infos().size();
}

}  // namespace dtrain::train
