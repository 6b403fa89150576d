import os, torch, time, sys, statistics
import seqkernels
torch.manual_seed(0)
cells=[tuple(map(int,c.split("x"))) for c in sys.argv[1].split(",")]
modes=sys.argv[2].split(",")
rounds=int(sys.argv[3]) if len(sys.argv)>3 else 7
for B,H in cells:
  T=256
  m = torch.nn.LSTM(H,H); s = seqkernels.LSTM(H,H); s.load_state_dict(m.state_dict())
  x = torch.randn(T,B,H); h0=torch.randn(1,B,H); c0=torch.randn(1,B,H)
  for mode in modes:
    if mode=="infer":
        def call(mod):
            with torch.no_grad(): mod(x,(h0,c0))
    else:
        xr=x.clone().requires_grad_()
        def call(mod):
            for p in mod.parameters(): p.grad=None
            y,_=mod(xr,(h0,c0)); y.sum().backward()
    cands={"nn":(m,None),"avx512":(s,"0"),"amx":(s,os.environ.get("AMX_B","1"))}
    ts={k:[] for k in cands}
    for r in range(rounds+1):
        for k,(mod,env) in cands.items():
            if env is not None: os.environ["SEQKERNELS_CPU_AMX"]=env
            if env == "": del os.environ["SEQKERNELS_CPU_AMX"]
            call(mod); t0=time.perf_counter(); call(mod); dt=time.perf_counter()-t0
            if r: ts[k].append(dt*1e3)
    med={k:statistics.median(v) for k,v in ts.items()}
    print(f"B={B} H={H} {mode}: nn {med['nn']:.2f} avx512 {med['avx512']:.2f} ({med['nn']/med['avx512']:.2f}x) amx {med['amx']:.2f} ({med['nn']/med['amx']:.2f}x)", flush=True)
