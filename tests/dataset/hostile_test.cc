// Corrupt and truncated dataset files: each must give one Error line naming the file (and the
// byte offset where there is one), never a crash or a huge allocation.
#include <gtest/gtest.h>

#include "runtime/data/dataset.h"
#include "runtime/data/image_io.h"
#include "tests/dataset/test_files.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;
using testing::idx_bytes;
using testing::ScratchDir;

// A valid mnist:DIR of 4 images of 2x2; tests then break one file.
class HostileIdx : public ::testing::Test {
 protected:
  HostileIdx() : dir_("hostile") {
    images_ = idx_bytes({4, 2, 2}, std::vector<uint8_t>(16, 100));
    labels_ = idx_bytes({4}, {0, 1, 2, 3});
  }
  void write(const std::vector<uint8_t>& images, const std::vector<uint8_t>& labels,
             bool gz_images = false) {
    std::filesystem::remove(dir_.file("train-images-idx3-ubyte"));
    std::filesystem::remove(dir_.file("train-images-idx3-ubyte.gz"));
    if (gz_images)
      testing::write_bytes(dir_.file("train-images-idx3-ubyte.gz"), images);
    else
      testing::write_bytes(dir_.file("train-images-idx3-ubyte"), images);
    testing::write_bytes(dir_.file("train-labels-idx1-ubyte"), labels);
  }
  std::string load(int64_t classes = 0) {
    return error_of([&] {
      LoadOptions o;
      o.num_classes = classes;
      load_dataset(parse_data_spec("mnist:" + dir_.path().string()), o);
    });
  }
  ScratchDir dir_;
  std::vector<uint8_t> images_, labels_;
};

TEST_F(HostileIdx, ValidFilesLoadPlainAndGzip) {
  write(images_, labels_);
  LoadedData d = load_dataset(parse_data_spec("mnist:" + dir_.path().string()), {});
  EXPECT_EQ(d.train.size(), 4);
  EXPECT_FALSE(d.test.has_value());
  write(testing::gzip_bytes(images_), labels_, true);
  EXPECT_EQ(load_dataset(parse_data_spec("mnist:" + dir_.path().string()), {}).train.size(), 4);
}

TEST_F(HostileIdx, TruncatedGzip) {
  std::vector<uint8_t> gz = testing::gzip_bytes(images_);
  ASSERT_GT(gz.size(), 30u);
  gz.erase(gz.end() - 10, gz.end());  // cuts into the deflate stream / trailer
  write(gz, labels_, true);
  std::string e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: truncated gzip stream: the compressed data ends "
                   "at byte offset " +
                   std::to_string(gz.size())),
            std::string::npos)
      << e;
  // Cut just after the gzip header: nothing decompresses at all.
  write({gz.begin(), gz.begin() + 12}, labels_, true);
  e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: truncated gzip stream: the compressed data ends "
                   "at byte offset 12"),
            std::string::npos)
      << e;
}

TEST_F(HostileIdx, CorruptGzipData) {
  std::vector<uint8_t> gz = testing::gzip_bytes(images_);
  for (size_t i = 12; i < gz.size() - 8; ++i) gz[i] ^= 0x5A;
  write(gz, labels_, true);
  std::string e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: corrupt gzip data ("), std::string::npos) << e;
}

TEST_F(HostileIdx, WrongMagic) {
  std::vector<uint8_t> bad = images_;
  bad[2] = 0x0D;  // float IDX
  write(bad, labels_);
  std::string e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte: bad IDX magic 0x00000D03 at byte offset 0"),
            std::string::npos)
      << e;
  write(images_, images_);  // an images file where the labels belong
  e = load();
  EXPECT_NE(e.find("train-labels-idx1-ubyte: bad IDX magic 0x00000803"), std::string::npos) << e;
}

TEST_F(HostileIdx, DimsDisagreeWithFileSize) {
  write(idx_bytes({5, 2, 2}, std::vector<uint8_t>(16, 1)), idx_bytes({5}, {0, 1, 2, 3, 4}));
  std::string e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte: IDX dims (5,2,2) need 20 bytes"), std::string::npos)
      << e;
  EXPECT_NE(e.find("after byte offset 16"), std::string::npos) << e;
  write(idx_bytes({3, 2, 2}, std::vector<uint8_t>(16, 1)), idx_bytes({3}, {0, 1, 2}));
  e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte: unexpected data after byte offset 28"),
            std::string::npos)
      << e;
  // gzip: the size is only known while decompressing.
  write(testing::gzip_bytes(idx_bytes({5, 2, 2}, std::vector<uint8_t>(16, 1))),
        idx_bytes({5}, {0, 1, 2, 3, 4}), true);
  e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte.gz: file ends at byte offset 32"), std::string::npos)
      << e;
  // Header truncated inside the dims.
  write({images_.begin(), images_.begin() + 9}, labels_);
  e = load();
  EXPECT_NE(e.find("file ends at byte offset 9 inside the IDX dimensions"), std::string::npos) << e;
}

TEST_F(HostileIdx, HugeDimsAreRefusedBeforeAllocating) {
  write(idx_bytes({0xFFFFFFFFu, 0xFFFFu, 0xFFFFu}, {}), idx_bytes({0xFFFFFFFFu}, {}));
  std::string e = load();
  EXPECT_NE(e.find("train-images-idx3-ubyte: IDX dims (4294967295,65535,65535) exceed"),
            std::string::npos)
      << e;
  // Within the global cap but far beyond what a small gzip file can hold.
  write(testing::gzip_bytes(idx_bytes({1000000, 28, 28}, {})), idx_bytes({1000000}, {}), true);
  e = load();
  EXPECT_NE(e.find("cannot hold that"), std::string::npos) << e;
}

TEST_F(HostileIdx, LabelCountDiffersFromImageCount) {
  write(images_, idx_bytes({3}, {0, 1, 2}));
  std::string e = load();
  EXPECT_NE(e.find("train-labels-idx1-ubyte: 3 labels"), std::string::npos) << e;
  EXPECT_NE(e.find("has 4 images"), std::string::npos) << e;
}

TEST_F(HostileIdx, LabelOutOfRangeForTheModel) {
  write(images_, idx_bytes({4}, {0, 1, 12, 3}));
  std::string e = load(10);
  EXPECT_NE(e.find("train-labels-idx1-ubyte: label 12 at byte offset 10 (example 2) is out of "
                   "range for a model with 10 classes"),
            std::string::npos)
      << e;
  EXPECT_EQ(load_dataset(parse_data_spec("mnist:" + dir_.path().string()), {}).train.num_classes(),
            13);  // unchecked without a model class count
}

TEST_F(HostileIdx, MissingFiles) {
  std::string e = load();
  EXPECT_NE(e.find("no train-images-idx3-ubyte"), std::string::npos) << e;
}

TEST(HostileImages, UnreadableAndTruncatedImages) {
  ScratchDir dir("badimg");
  std::filesystem::create_directories(dir.path() / "c");
  testing::write_bytes(dir.file("c/garbage.png"), {'n', 'o', 't', ' ', 'p', 'n', 'g'});
  std::string spec = "images:" + dir.path().string();
  std::string e = error_of([&] { load_dataset(parse_data_spec(spec), {}); });
  EXPECT_NE(e.find("garbage.png: unreadable image"), std::string::npos) << e;
  std::filesystem::remove(dir.file("c/garbage.png"));

  std::vector<uint8_t> px(16 * 16 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 31);
  testing::write_png(dir.file("c/ok.png"), 16, 16, 3, px);
  std::vector<uint8_t> png = testing::read_bytes(dir.file("c/ok.png"));
  testing::write_bytes(dir.file("c/short.png"),
                       {png.begin(), png.begin() + static_cast<long>(png.size() / 2)});
  e = error_of([&] { load_dataset(parse_data_spec(spec), {}); });
  EXPECT_NE(e.find("short.png: unreadable PNG"), std::string::npos) << e;
  std::filesystem::remove(dir.file("c/short.png"));

  testing::write_jpeg(dir.file("c/full.jpg"), 16, 16, 3, px);
  std::vector<uint8_t> jpg = testing::read_bytes(dir.file("c/full.jpg"));
  testing::write_bytes(dir.file("c/cut.jpg"),
                       {jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2)});
  e = error_of([&] { decode_image_file(dir.file("c/cut.jpg")); });
  EXPECT_NE(e.find("cut.jpg: unreadable JPEG"), std::string::npos) << e;
  std::filesystem::remove(dir.file("c/cut.jpg"));
  // A PNG header claiming 100000 x 100000 pixels (valid CRC) is refused before decoding.
  std::vector<uint8_t> huge = png;
  for (int k : {16, 20}) {  // IHDR width and height, big-endian
    huge[k] = 0, huge[k + 1] = 0x01, huge[k + 2] = 0x86, huge[k + 3] = 0xA0;
  }
  uLong crc = crc32(0, huge.data() + 12, 17);  // chunk type + 13 data bytes
  for (int b = 0; b < 4; ++b) huge[29 + b] = static_cast<uint8_t>(crc >> (24 - 8 * b));
  testing::write_bytes(dir.file("c/huge.png"), huge);
  e = error_of([&] { decode_image_file(dir.file("c/huge.png")); });
  EXPECT_NE(e.find("huge.png: image of 100000x100000 pixels exceeds the limit"), std::string::npos)
      << e;
  std::filesystem::remove(dir.file("c/huge.png"));

  std::filesystem::create_directories(dir.path() / "empty_class");
  e = error_of([&] { load_dataset(parse_data_spec(spec), {}); });
  EXPECT_NE(e.find("empty_class: class folder has no"), std::string::npos) << e;
}

}  // namespace
}  // namespace onnxtrain::runtime
