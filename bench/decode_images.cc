// images: streaming throughput (bench/decode_images.sh): writes folders of JPEG files and times
// the DataLoader's decode + augment of them per worker count. Not part of ctest.
//   decode_images write DIR N MIN_SIDE MAX_SIDE      N RGB JPEGs in 10 class folders
//   decode_images time DIR WORKERS AUGMENT SIZE      one epoch at batch 32 into (3,SIZE,SIZE)
#include <turbojpeg.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/random.h"

namespace rt = onnxtrain::runtime;
namespace fs = std::filesystem;

// Smooth gradients plus noise: JPEG sizes like a photo's rather than a flat block's.
void write_jpegs(const std::string& dir, int n, int min_side, int max_side) {
  tjhandle tj = tjInitCompress();
  rt::DataRng rng(1, 2);
  for (int i = 0; i < n; ++i) {
    const int w = min_side + static_cast<int>(rng.below(static_cast<uint64_t>(max_side - min_side + 1)));
    const int h = min_side + static_cast<int>(rng.below(static_cast<uint64_t>(max_side - min_side + 1)));
    std::vector<unsigned char> px(static_cast<size_t>(w * h * 3));
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c)
          px[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<unsigned char>(
              (x * (c + 1) * 255 / w + y * 128 / h + i * 17 + rng.below(24)) & 0xFF);
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    if (tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0) != 0) {
      std::fprintf(stderr, "decode_images: %s\n", tjGetErrorStr2(tj));
      std::exit(1);
    }
    const fs::path cls = fs::path(dir) / ("c" + std::to_string(i % 10));
    fs::create_directories(cls);
    std::ofstream(cls / (std::to_string(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(size));
    tjFree(buf);
  }
  tjDestroy(tj);
}

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 6) {
      write_jpegs(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
      return 0;
    }
    if (cmd == "time" && argc == 6) {
      const int64_t size = std::atoi(argv[5]);
      rt::LoadOptions lo;
      lo.model_input = {3, size, size};
      rt::Dataset d = rt::load_dataset(rt::parse_data_spec(std::string("images:") + argv[2]), lo).train;
      rt::LoaderOptions o;
      o.batch_size = 32;
      o.images.workers = std::atoi(argv[3]);
      const std::optional<rt::Augment> augment = rt::parse_augment(argv[4]);
      if (!augment) {
        std::fprintf(stderr, "decode_images: error: augment '%s': expected none, basic or imagenet\n",
                     argv[4]);
        return 2;
      }
      o.images.augment = *augment;
      const auto t0 = std::chrono::steady_clock::now();
      rt::DataLoader loader(d, rt::InputAdapter::for_dataset(d, lo.model_input), o);
      for (int64_t s = 0; s < loader.steps_per_epoch(); ++s) loader.next();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%lld images, %d worker(s), augment %s, into 3x%lldx%lld: %.2f s, %.0f images/s\n",
                  static_cast<long long>(d.size()), o.images.workers, argv[4],
                  static_cast<long long>(size), static_cast<long long>(size), sec,
                  static_cast<double>(d.size()) / sec);
      return 0;
    }
    std::fprintf(stderr, "usage: decode_images write DIR N MIN MAX | time DIR WORKERS AUGMENT SIZE\n");
    return 2;
  } catch (const onnxtrain::Error& e) {
    std::fprintf(stderr, "decode_images: error: %s\n", e.what());
    return 1;
  }
}
