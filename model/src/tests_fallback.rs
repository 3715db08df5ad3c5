//! Per-device CPU fallback inside the meta device (issue 21, item 4): a device that cannot run
//! one op keeps its place in the split; its slice of that op runs on the host CPU, and the
//! model's logits stay equal to the unsplit run.

use super::*;
use std::sync::Arc;
use tessera::sched::{SchedOptions, layer_devices};
use tessera::{
    Backend, BackendOptions, Buffer, BufferType, DType, Device, OpKind, TensorDesc, TensorId,
    registry,
};
use tessera::{DeviceCaps, DeviceType, MemoryInfo, Support};

/// A CPU device whose backend "lacks" one op (as a Vulkan device may lack a kernel).
#[derive(Debug)]
struct Picky {
    inner: Arc<dyn Device>,
    refuses: OpKind,
}

impl Device for Picky {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> String {
        format!("{} without {:?}", self.inner.description(), self.refuses)
    }
    fn backend_name(&self) -> &str {
        "picky"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Accel
    }
    fn memory(&self) -> MemoryInfo {
        self.inner.memory()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        if tensors[node.index()].op().kind() == self.refuses {
            return Support::No(format!("no {:?} kernel", self.refuses));
        }
        self.inner.supports_op(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        self.inner.supports_buffer_type(buft)
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        self.inner.owns_buffer(buf)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        self.inner.can_access(buf)
    }
    fn init_backend(&self, opts: &BackendOptions) -> tessera::Result<Box<dyn Backend>> {
        self.inner.init_backend(opts)
    }
}

const PROMPT: [i32; 6] = [1, 17, 200, 3, 255, 9];

#[test]
fn a_device_lacking_an_op_runs_its_slice_on_the_host_cpu() {
    let model = LlamaModel::new(LlamaConfig::tiny(), 0xfa11).unwrap();
    let cpu = registry().select("cpu:1").unwrap();
    let ld = layer_devices(model.config().n_layer, &[], 1).unwrap();
    let mut reference = Session::on_devices(&model, &cpu, &ld, SchedOptions::default()).unwrap();
    let devs = registry().select("cpu:2").unwrap();
    for refuses in [OpKind::RmsNorm, OpKind::Rope] {
        let picky: Arc<dyn Device> = Arc::new(Picky {
            inner: devs[0].clone(),
            refuses,
        });
        let meta = model.meta_device(&[picky, devs[1].clone()], &[]).unwrap();
        let mut s = Session::on_meta(&model, meta, Some(1)).unwrap();
        reference.reset();
        for chunk in [&PROMPT[..], &[7], &[8]] {
            let want = reference.eval(chunk).unwrap();
            let got = s.eval(chunk).unwrap();
            let e = nmse(&got, &want);
            assert!(e <= 1e-6, "{refuses:?}: nmse {e:e}");
        }
        let fb = s.tp().fallbacks().to_vec();
        assert_eq!(fb.len(), 1, "{refuses:?} {fb:?} {}", s.tp().describe());
        assert_eq!(fb[0].0, devs[0].name());
        let (op, n) = &fb[0].1[0];
        assert!(*n >= model.config().n_layer, "{fb:?}");
        let d = s.tp().describe();
        assert!(
            d.contains(&format!(
                "on the host CPU instead: {}: {op} ×{n}",
                devs[0].name()
            )),
            "{d}"
        );
    }
}

#[test]
fn the_heaviest_op_falls_back_with_quantized_weights_and_uneven_ratios() {
    // Every MUL_MAT of the second device (a quarter of each weight, Q8_0) runs on the host CPU:
    // weights slices copied out per run, outputs copied back; the logits still match.
    let model = LlamaModel::new(
        LlamaConfig {
            weight_dtype: DType::Q8_0,
            ..LlamaConfig::tiny()
        },
        0xfa12,
    )
    .unwrap();
    let cpu = registry().select("cpu:1").unwrap();
    let ld = layer_devices(model.config().n_layer, &[], 1).unwrap();
    let mut reference = Session::on_devices(&model, &cpu, &ld, SchedOptions::default()).unwrap();
    let devs = registry().select("cpu:2").unwrap();
    let picky: Arc<dyn Device> = Arc::new(Picky {
        inner: devs[1].clone(),
        refuses: OpKind::MulMat,
    });
    let meta = model
        .meta_device(&[devs[0].clone(), picky], &[3.0, 1.0])
        .unwrap();
    let mut s = Session::on_meta(&model, meta, Some(1)).unwrap();
    let e = nmse(&s.eval(&PROMPT).unwrap(), &reference.eval(&PROMPT).unwrap());
    assert!(e <= 1e-5, "nmse {e:e}");
    let fb = s.tp().fallbacks().to_vec();
    assert_eq!(fb[0].0, devs[1].name());
    assert_eq!(fb[0].1[0].0, "MUL_MAT");
}
