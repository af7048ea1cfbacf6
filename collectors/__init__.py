"""inferledger.collectors"""
