from conclave.app.cli import main

# The guard matters: worker processes (verify's regex sandbox) re-import the main module.
if __name__ == "__main__":
    raise SystemExit(main())
