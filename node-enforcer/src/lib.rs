pub mod cni_plugin;
