"""What a person does to a run: resume, restart, cancel, settle an effect, adopt, replay."""
